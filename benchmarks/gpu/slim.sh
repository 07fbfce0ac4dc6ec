#!/usr/bin/env bash
# Move the committed drafters (fold_hf/assets/*-dflash, 23-24 MB each) out of the work tree for GPU staging calls,
# and back. A device call carries the work tree (tracked files present + untracked not ignored + carry) up to
# 64 MiB; with both drafters the tree is ~62 MB and no GGUF part fits (stage-gemma3.sh), so:
#
#   bash benchmarks/gpu/slim.sh out [KEEP ...]   every drafter but KEEP (e.g. gemma3-270m-dflash) to .gpu/aside/
#   bash benchmarks/gpu/slim.sh restore          every drafter back into fold_hf/assets/
#   bash benchmarks/gpu/slim.sh status           where each drafter is, and the bytes a call carries now
#
# Idempotent: `out` leaves exactly KEEP in the tree (bringing a kept one back from aside if needed), `restore` with
# nothing aside does nothing. It refuses to move a drafter whose files have uncommitted changes (or untracked
# files), or when a drafter is both in the tree and aside. .gpu/ is ignored (.gitignore), so nothing aside is
# committed or carried; a drafter aside is marked skip-worktree, so `git add -A` and `git commit -a` cannot record it
# as deleted (`git status` stays clean); `restore` clears the mark.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
aside=.gpu/aside
drafters=(smollm2-135m-dflash gemma3-270m-dflash)

clean() {  # the drafter's files in the tree equal HEAD, nothing untracked
  [ -z "$(git status --porcelain --untracked-files=all -- "fold_hf/assets/$1")" ]
}
bring_back() {
  local d=$1
  if [ -d "$aside/$d" ]; then
    [ -e "fold_hf/assets/$d" ] && { echo "slim: $d is both in fold_hf/assets and in $aside; resolve by hand" >&2; exit 1; }
    mv "$aside/$d" "fold_hf/assets/$d"
    git ls-files -z -- "fold_hf/assets/$d" | xargs -0 git update-index --no-skip-worktree
    clean "$d" || echo "slim: warning: restored $d differs from HEAD (git status -- fold_hf/assets/$d)" >&2
    echo "restored $d"
  fi
}
put_aside() {
  local d=$1
  if [ -e "fold_hf/assets/$d" ]; then
    [ -e "$aside/$d" ] && { echo "slim: $d is both in fold_hf/assets and in $aside; resolve by hand" >&2; exit 1; }
    clean "$d" || { echo "slim: fold_hf/assets/$d has uncommitted changes; commit or discard them first" >&2; exit 1; }
    mkdir -p "$aside"
    # skip-worktree first: while aside, `git add -A` / `commit -a` cannot record the drafter as deleted
    git ls-files -z -- "fold_hf/assets/$d" | xargs -0 git update-index --skip-worktree
    mv "fold_hf/assets/$d" "$aside/$d"
    echo "moved $d to $aside"
  elif [ -d "$aside/$d" ]; then
    echo "$d already aside"
  else
    echo "slim: $d is neither in fold_hf/assets nor in $aside" >&2; exit 1
  fi
}
case "${1:-status}" in
  out)
    shift
    for k in "$@"; do
      printf '%s\n' "${drafters[@]}" | grep -qx "$k" || { echo "slim: unknown drafter $k (${drafters[*]})" >&2; exit 2; }
    done
    # check every drafter to be moved before moving any
    for d in "${drafters[@]}"; do
      printf '%s\n' "$@" | grep -qx "$d" && continue
      if [ -e "fold_hf/assets/$d" ] && ! clean "$d"; then
        echo "slim: fold_hf/assets/$d has uncommitted changes; commit or discard them first" >&2; exit 1
      fi
    done
    for d in "${drafters[@]}"; do
      if printf '%s\n' "$@" | grep -qx "$d"; then bring_back "$d"; else put_aside "$d"; fi
    done ;;
  restore)
    for d in "${drafters[@]}"; do bring_back "$d"; done ;;
  status) ;;
  *) echo "usage: bash benchmarks/gpu/slim.sh out [KEEP ...] | restore | status" >&2; exit 2 ;;
esac
for d in "${drafters[@]}"; do
  if [ -e "fold_hf/assets/$d" ]; then where=tree; elif [ -d "$aside/$d" ]; then where=aside; else where=missing; fi
  echo "$d: $where"
done
echo "a call carries $(python3 benchmarks/gpu/parts.py tree) bytes of work tree (limit $((64 * 1024 * 1024)))"
