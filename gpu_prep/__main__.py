"""`python -m gpu_prep ...` runs the gpu-prep command."""

from gpu_prep.launch import main

main()
