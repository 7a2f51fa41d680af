"""Workspace API served inside every sandbox pod."""

__version__ = "0.1.0"
