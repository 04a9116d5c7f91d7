#!/bin/bash
# Builds a signed, flat apt repository of stand-ins for NVIDIA's packages, laid out like NVIDIA's
# (<out>/debian12/x86_64/), with their real names and versions but nothing inside: the role's apt
# logic (source, Signed-By, pins, holds, exact-version upgrades) runs for real on them. The daemons
# are `sleep infinity` units so that systemd can really enable and start them. The one thing of the
# driver they carry is the simulated nvidia-smi (package nvidia-smi, as in NVIDIA's Debian repository):
# on a bare sim box, installing the driver is what makes the GPUs visible. Its postinst does what
# modprobe does on a box with no NVIDIA module loaded yet (loads the installed version); an upgrade
# leaves the loaded one until a reboot, as a real box does. 575.64.05's nvidia-smi cannot run (a
# broken driver release).
# Usage: build-stand-in-cuda-repo.sh OUT_DIR KERNEL_RELEASE   (needs dpkg-deb, dpkg-scanpackages, gpg)
set -euo pipefail
out=$1
kernel=$2
simulator="$(cd "$(dirname "$0")" && pwd)/roles/sim_box/files/nvidia-smi"
arch=$(dpkg --print-architecture)
work=$(mktemp -d)
export GNUPGHOME="$work/gnupg"
trap 'gpgconf --kill gpg-agent 2>/dev/null || true; rm -rf "$work"' EXIT
repo="$out/debian12/x86_64"
rm -rf "$out"
mkdir -p "$repo" "$GNUPGHOME"
chmod 700 "$GNUPGHOME"

# deb NAME VERSION [DEPENDS] [UNIT]
deb() {
    local name=$1 version=$2 depends=${3:-} unit=${4:-}
    local root="$work/pkg/${name}_$version"
    mkdir -p "$root/DEBIAN" "$root/usr/share/doc/$name"
    {
        echo "Package: $name"
        echo "Version: $version"
        echo "Architecture: $arch"
        echo "Maintainer: specfleet tests <ci@specfleet.invalid>"
        if [ -n "$depends" ]; then echo "Depends: $depends"; fi
        echo "Description: stand-in for NVIDIA's $name (specfleet tests)"
        echo " Same name and version as NVIDIA's package; installs nothing of the driver."
    } >"$root/DEBIAN/control"
    echo "$name $version" >"$root/usr/share/doc/$name/STAND-IN"
    if [ -n "$unit" ]; then
        mkdir -p "$root/lib/systemd/system"
        printf '[Unit]\nDescription=%s %s (specfleet stand-in)\n\n[Service]\nType=exec\nExecStart=/bin/sleep infinity\n\n[Install]\nWantedBy=multi-user.target\n' \
            "$unit" "$version" >"$root/lib/systemd/system/$unit.service"
    fi
    dpkg-deb --root-owner-group -Zgzip -z1 --build "$root" "$repo/${name}_${version}_$arch.deb" >/dev/null
}

# nvidia-smi VERSION: the simulated nvidia-smi, reading the GPUs the sim box recorded
# (/usr/local/share/sim-nvidia-smi) and the loaded driver from /run (a reboot clears it).
smi_deb() {
    local version=$1 driver=${1%-*}
    local root="$work/pkg/nvidia-smi_$version"
    mkdir -p "$root/DEBIAN" "$root/usr/bin" "$root/usr/lib/sim-nvidia"
    install -m 0755 "$simulator" "$root/usr/lib/sim-nvidia/nvidia-smi"
    if [ "$driver" = 575.64.05 ]; then
        printf '#!/bin/sh\necho "nvidia-smi: error while loading shared libraries: libnvidia-ml.so.1: cannot open shared object file: No such file or directory" >&2\nexit 127\n' \
            >"$root/usr/bin/nvidia-smi"
    else
        printf '#!/bin/sh\nSIM_NVIDIA_SMI_DRIVER=/run/sim-nvidia/driver-version exec python3 /usr/lib/sim-nvidia/nvidia-smi "$@"\n' \
            >"$root/usr/bin/nvidia-smi"
    fi
    chmod 0755 "$root/usr/bin/nvidia-smi"
    printf '#!/bin/sh\nset -e\nif [ "$1" = configure ] && [ ! -e /run/sim-nvidia/driver-version ]; then\n    mkdir -p /run/sim-nvidia\n    echo %s >/run/sim-nvidia/driver-version\nfi\n' \
        "$driver" >"$root/DEBIAN/postinst"
    chmod 0755 "$root/DEBIAN/postinst"
    {
        echo "Package: nvidia-smi"
        echo "Version: $version"
        echo "Architecture: $arch"
        echo "Maintainer: specfleet tests <ci@specfleet.invalid>"
        echo "Description: stand-in for NVIDIA's nvidia-smi (specfleet tests)"
        echo " Same name and version as NVIDIA's package; a simulated nvidia-smi."
    } >"$root/DEBIAN/control"
    dpkg-deb --root-owner-group -Zgzip -z1 --build "$root" "$repo/nvidia-smi_${version}_$arch.deb" >/dev/null
}

# Three real 575 releases: the base (the recorded box's driver), the explicit upgrade, and a newer
# one the pins must keep away (and whose nvidia-smi is broken).
for driver in 575.57.08 575.64.03 575.64.05; do
    v="$driver-1"
    deb nvidia-open-575 "$v" "nvidia-persistenced (= $v), libnvidia-ml1 (= $v), nvidia-smi (= $v)"
    deb cuda-drivers-575 "$v" "nvidia-persistenced (= $v), libnvidia-ml1 (= $v), nvidia-smi (= $v)"
    smi_deb "$v"
    deb nvidia-persistenced "$v" "" nvidia-persistenced
    deb libnvidia-ml1 "$v"
    deb nvidia-fabricmanager-575 "$v" "" nvidia-fabricmanager
    deb libnvidia-nscq-575 "$v"
done
for toolkit in 12.9.0 12.9.1; do
    deb cuda-toolkit-12-9 "$toolkit-1"
done
deb "linux-headers-$kernel" 1.0

cd "$repo"
dpkg-scanpackages --multiversion . 2>/dev/null >Packages
gzip -9 --keep Packages
{
    echo "Origin: specfleet stand-in"
    echo "Label: specfleet stand-in for NVIDIA's CUDA repository"
    echo "Architectures: $arch"
    echo "Date: $(date -Ru)"
    echo "SHA256:"
    for index in Packages Packages.gz; do
        echo " $(sha256sum "$index" | cut -d' ' -f1) $(stat -c%s "$index") $index"
    done
} >Release
# A throwaway key, so that Signed-By and signature checking are exercised for real.
gpg --batch --quiet --pinentry-mode loopback --passphrase '' \
    --quick-gen-key "specfleet stand-in CUDA repository <ci@specfleet.invalid>" ed25519 sign never
gpg --batch --quiet --yes --clearsign --output InRelease Release
gpg --batch --quiet --yes --armor --detach-sign --output Release.gpg Release
gpg --batch --quiet --armor --export >"$out/stand-in-key.asc"
