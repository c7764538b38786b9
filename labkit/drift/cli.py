"""placeholder: filled in below"""
