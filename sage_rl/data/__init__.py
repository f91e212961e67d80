"""Datasets for supervised fine-tuning: chat records with provenance, and their export formats."""
