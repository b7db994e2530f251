"""Models: the tiny Qwen2-architecture policy, its character tokenizer, base-policy pretraining."""
