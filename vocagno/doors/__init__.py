"""The two doors: ``untrusted`` checks every file from elsewhere before it is read; ``writing`` writes every
file vocagno makes, never through a link; ``private`` makes the private folders and checked copies that a framework
then loads.
"""
