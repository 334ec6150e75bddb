"""Text stages: Wikipedia (wikiextractor output) to the sentence-per-line parts `create` reads.

Stages (`python -m bertperf prep <stage>`): dictd.py, clean.py, segment.py, split.py.
Library: punkt345.py (nltk 3.4.5's sentence splitting on the installed nltk).
"""
