"""What the store's tiers share: metas, field schemas, packed rows, data updates, row cutting."""
