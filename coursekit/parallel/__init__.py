"""parallel: one module per strategy (``data``, then model, pipeline, tensor, sequence in later chapters)."""
