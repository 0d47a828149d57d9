"""The archive: publication (write side), remote verification, and reads (fetch)."""
