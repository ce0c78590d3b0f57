/** Tenants named in metric labels at most; the rest are counted as `other` (a key file can name thousands). */
export const MAX_TENANT_LABELS = 20;

/**
 * Label values that come from clients (tenants): the first `max` distinct ones as they are, every
 * later one as `other`, so a label's series stay bounded however many names arrive.
 */
export class BoundedLabels {
  private readonly named = new Set<string>();

  constructor(private readonly max = MAX_TENANT_LABELS) {}

  of(value: string): string {
    if (this.named.has(value)) return value;
    if (this.named.size >= this.max) return 'other';
    this.named.add(value);
    return value;
  }
}
