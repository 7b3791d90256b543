"""extender"""
