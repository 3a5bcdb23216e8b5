"""Pipe classes, one module per family of verbs. Importing this package registers them."""
