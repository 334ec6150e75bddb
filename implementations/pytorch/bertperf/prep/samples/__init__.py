"""Sample stages: sentence-per-line text to the reference's exact pretraining samples.

Stages (`python -m bertperf prep <stage>`): create.py (`create`), pick_eval.py (`eval`).
Library: tokenization.py (the reference tokenizer), instances.py (the instance algorithm in
Python) and _fastcreate.c (its C twin).
"""
