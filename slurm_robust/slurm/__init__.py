"""TODO-doc"""
