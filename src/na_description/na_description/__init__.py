"""Robot tables (joint names, servo ids, register maps, limits, model files) and robot descriptions: the single source of truth per robot."""
