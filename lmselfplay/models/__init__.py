"""The embedded tiny model (tiny.py) and the synthetic corpus it is pre-trained on (corpus.py)."""
