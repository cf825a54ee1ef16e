-- a reader reads the lake's data path and nothing else
SET allowed_directories = [$folder]
