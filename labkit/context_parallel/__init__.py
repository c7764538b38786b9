"""Context parallelism (chapter "Context parallelism"): not in labkit yet."""
