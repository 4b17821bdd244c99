"""Special token ids, fixed project-wide so the model, the data and the decoders agree."""

PAD_ID = 0  # padding; never attended to as a key, ignored by the loss
UNK_ID = 1  # unknown piece
BOS_ID = 2  # begin of sentence: the first decoder input (§3.1, "shifted right")
EOS_ID = 3  # end of sentence: appended to sources and targets
