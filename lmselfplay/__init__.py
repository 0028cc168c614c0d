"""lmselfplay: fine-tune a language model by self-play with reliable referees."""

__version__ = "0.1.0"
