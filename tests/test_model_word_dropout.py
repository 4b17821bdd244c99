"""Word dropout (aiayn/model/dropout.py, `Config.p_word_drop`): the rate, the specials it keeps,
and the encoder reading the dropped words in training only."""

import pytest
import torch

from aiayn.model.dropout import word_dropout


def test_word_dropout_rate_keeps_specials_and_is_off_in_eval():
    from aiayn.special import UNK_ID

    torch.manual_seed(0)
    ids = torch.randint(4, 1000, (400, 500))
    ids[:, :4] = torch.tensor([0, 1, 2, 3])  # PAD, UNK, BOS, EOS in every row
    out = word_dropout(ids, 0.3, training=True)
    assert torch.equal(out[:, :4], ids[:, :4])
    changed = out[:, 4:] != ids[:, 4:]
    assert torch.all(out[:, 4:][changed] == UNK_ID)
    n = changed.numel()
    assert abs(changed.float().mean().item() - 0.3) < 5 * (0.3 * 0.7 / n) ** 0.5
    assert word_dropout(ids, 0.3, training=False) is ids and word_dropout(ids, 0.0, True) is ids


def test_encoder_reads_dropped_words_as_unk_in_training_only():
    from aiayn.config import Config
    from aiayn.model import Transformer

    cfg = Config(vocab_size=30, n_layers=1, d_model=16, d_ff=32, n_heads=2, p_drop=0.0,
                 p_word_drop=0.5)
    torch.manual_seed(0)
    model = Transformer(cfg)
    src = torch.randint(4, 30, (3, 9))
    torch.manual_seed(5)
    dropped = word_dropout(src, 0.5, training=True)
    assert not torch.equal(dropped, src)
    torch.manual_seed(5)
    trained = model.train().encode(src)
    model.eval()
    torch.testing.assert_close(trained, model.encode(dropped))
    assert not torch.allclose(model.encode(src), trained)
    with pytest.raises(Exception, match="p_word_drop"):
        Config(vocab_size=30, arch="rnn", p_word_drop=0.1)
