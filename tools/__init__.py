"""Developer commands about the repository itself (not shipped): the package layout."""
