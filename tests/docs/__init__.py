"""Tests that run what the README says, word for word."""
