"""`teola bench --llamaindex EXAMPLE`: LlamaIndex QueryPipelines, plain vs `teola.optimize`."""
