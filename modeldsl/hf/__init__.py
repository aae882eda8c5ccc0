"""HuggingFace checkpoints: config mapping, safetensors import through hf_mapping, export through hf_export."""
