-- never install an extension from the network (the lake loads its own from their wheels)
SET autoinstall_known_extensions = false
