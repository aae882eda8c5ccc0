ANNOTATIONS = ()  # placeholder, being written
