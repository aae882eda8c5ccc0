"""Running models: the numpy reference executor, RoPE tables, the Model API."""
