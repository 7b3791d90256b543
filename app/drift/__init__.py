"""drift"""
