"""The public API: validation, hostile inputs, the impls CLI, backend declarations, the contract every backend meets."""
