"""English constituency parsing as sequence to sequence (§6.3): treebank reading and cleaning
(`treebank`), trees as token sequences and back (`linearize`), EVALB scoring (`evalb`).

Importing this package imports neither torch nor nltk.
"""
