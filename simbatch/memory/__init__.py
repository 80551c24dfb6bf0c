"""KV-cache memory: numbered blocks, the manager that hands them out, the prefix cache."""
