"""Models, tokenizers and the role→policy map."""
