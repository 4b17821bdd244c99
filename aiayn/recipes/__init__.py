"""End-to-end recipes built from the library: CMUdict grapheme-to-phoneme, Multi30k translation."""
