-- never load an extension on sight (the lake loads its own from their wheels)
SET autoload_known_extensions = false
