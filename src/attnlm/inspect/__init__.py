"""Looking inside models: parameter counts (:mod:`.params`), attention maps, embeddings."""
