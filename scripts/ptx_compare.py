#!/usr/bin/env python3
"""Which kernels two PTX files of one kernel instantiation define identically.

    nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -fmad=false -Iinclude -Isrc \
         -DG4C_INST=i -ptx -o new.ptx src/cuda/inst/kernel.cu   (and old.ptx from the old source;
         i indexes G4C_INST_MASKS in src/cuda/internal.h)
    python3 scripts/ptx_compare.py old.ptx new.ptx [KERNEL [LINES]]

Each .entry is compared after renaming virtual registers, branch labels and the translation
unit's internal-name hash by order of first appearance, so a kernel reported IDENTICAL is the same
program (ptxas then gives the same SASS): how a change that must leave the decode kernels alone is
checked without a GPU. With KERNEL, prints the first LINES lines of that kernel's diff."""
import difflib
import re
import sys


def normalise(text):
    text = re.sub(r'_ZN\d+_INTERNAL_[0-9a-f]+_', '_ZN_INTERNAL_', text)
    text = re.sub(r'\.reg \.\w+ \t%\w+<\d+>;', '', text)
    text = re.sub(r'// callseq \d+', '// callseq', text)
    names = {}

    def reg(m):
        table = names.setdefault(m.group(1), {})
        return table.setdefault(m.group(0), '%%%s_%d' % (m.group(1), len(table)))

    text = re.sub(r'%(rd|rs|fd|r|f|p)\d+', reg, text)
    labels = {}
    return re.sub(r'\$L__BB\d+_\d+', lambda m: labels.setdefault(m.group(0), 'L%d' % len(labels)), text)


def kernels(path):
    with open(path) as f:
        text = f.read()
    out = {}
    for m in re.finditer(r'\.visible \.entry (\S+)\(', text):
        end = text.find('\n}\n', m.start())
        out[m.group(1)] = normalise(text[m.start():end]).splitlines()
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    old, new = kernels(sys.argv[1]), kernels(sys.argv[2])
    for name in sorted(set(old) | set(new)):
        if name not in old or name not in new:
            print(name, 'only in', sys.argv[2] if name in new else sys.argv[1])
        elif old[name] == new[name]:
            print(name, 'IDENTICAL')
        else:
            changed = sum(1 for l in difflib.unified_diff(old[name], new[name], lineterm='', n=0)
                          if l[:1] in '+-' and not l.startswith(('+++', '---')))
            print(name, 'differs: %d lines of %d' % (changed, len(old[name])))
    if len(sys.argv) > 3:
        name = sys.argv[3]
        diff = difflib.unified_diff(old.get(name, []), new.get(name, []), lineterm='', n=2)
        print('\n'.join(list(diff)[:int(sys.argv[4]) if len(sys.argv) > 4 else 60]))


if __name__ == '__main__':
    main()
