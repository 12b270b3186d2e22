"""Shards and batches: the MDS shard schema, the streaming dataset and its collator, out-roots of jobs made of
parts.
"""
