"""What a teacher keeps and why: canaries.
"""
