"""Process hygiene: fork-safety, the clean reader, owner watch, /dev/shm."""
