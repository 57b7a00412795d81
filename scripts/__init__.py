"""Scripts run by hand (the GPU check); a package so that torchrun can start `-m scripts.gpu_check_ranks`."""
