"""A corpus read as documents (``sources``: files, folders, object stores, Hugging Face datasets), for the converter
(``conversion/convert_dataset.py``) and every other reader of a user's text files (``vocagno.eval --bpb``)."""
