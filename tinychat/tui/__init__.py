"""The Textual app (`tinychat` in a terminal): see app.py. Importing this package does not import torch."""
