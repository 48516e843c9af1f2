/** ModelLabels (src/proxy/model-labels.ts): the bounded set of model label values. */
import { describe, expect, it } from 'vitest';
import { ModelLabels } from '../src/proxy/model-labels.js';

describe('ModelLabels: the model label set, capped per pool for the life of the process', () => {
  it('admits discovered names up to the cap, keeps them for good, and reports the first refusal once per pool', () => {
    const labels = new ModelLabels();
    labels.configure(['configured']);
    expect(labels.admit('p', 2, ['configured', 'a', 'b'])).toEqual({ refused: 0, firstRefusal: false });
    expect(labels.admit('p', 2, ['c', 'd'])).toEqual({ refused: 2, firstRefusal: true });
    expect(labels.admit('p', 2, ['e'])).toEqual({ refused: 1, firstRefusal: false });
    // Another pool has a cap of its own; a name already labelled costs no pool a place.
    expect(labels.admit('q', 1, ['a', 'f', 'g'])).toEqual({ refused: 1, firstRefusal: true });
    expect(['configured', 'a', 'b', 'c', 'f', 'g'].map((m) => labels.label(m))).toEqual(['configured', 'a', 'b', '_other', 'f', '_other']);
    // A name once labelled keeps its label though discovery no longer lists it.
    expect(labels.admit('p', 2, ['z'])).toEqual({ refused: 1, firstRefusal: false });
    expect(labels.label('b')).toBe('b');
  });
});
