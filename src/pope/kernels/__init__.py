"""Triton kernels (no autograd, no input validation): see pope_flash.py.

Importing this package does not import Triton; `from pope.kernels import pope_flash` does.
"""
