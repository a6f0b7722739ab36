"""The run record: its schema, writing and reading records, and the code version that made them."""
