"""Models: the 3D ViT encoder (vit3d), the V-JEPA predictor (predictor), task heads (heads)."""
