"""Foundations every layer may use: typed errors, hashing and atomic files, logging setup, the numeric comparison."""
