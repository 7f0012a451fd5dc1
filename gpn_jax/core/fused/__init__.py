"""The fused window: GPN's training window as one custom-VJP function over blocked weights
(`window` is its entry and says how the parts fit: `layout`, `stages`, `products`, `forward`,
`backward`, `loss`)."""
