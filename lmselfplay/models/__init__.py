"""Which model a run uses and how it is loaded: policy loading + LoRA (policy.py), the embedded
tiny model (tiny.py) and the corpus it is pre-trained on (corpus.py), the stand-ins of real
families (standins.py, chat_templates.py)."""
