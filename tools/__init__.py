"""Developer commands about the repository itself, run from its root (not shipped): the package
layout and the generated documentation."""
