use super::*;

#[test]
fn dad_probes_and_what_counts_as_a_conflict() {
    let ours: Ipv6Addr = "fd00:59::2".parse().unwrap();
    let p = dad_solicitation(ours);
    assert_eq!(p[0] >> 4, 6);
    assert_eq!(&p[8..24], &[0u8; 16], "from ::");
    assert_eq!(&p[24..40], &solicited_node(ours).octets());
    assert_eq!(p[40], 135);
    assert_eq!(&p[48..64], &ours.octets());
    assert_eq!(p.len(), 64, "no source link-layer option from ::");
    // The checksum verifies: summing with it included gives 0.
    assert_eq!(
        icmpv6_checksum(Ipv6Addr::UNSPECIFIED, solicited_node(ours), &p[40..]),
        0
    );
    assert_eq!(
        multicast_mac(solicited_node(ours)),
        [0x33, 0x33, 0xff, 0, 0, 2]
    );
    let wire = [2, 0, 0, 0, 0, 7];
    // Another host probing for the same address at the same time.
    assert_eq!(dad_conflict(&p, ours, wire), Some(wire));
    // Its advertisement, with and without the target option.
    let mut na = [0u8; 72];
    na[0] = 0x60;
    na[6] = 58;
    na[8] = 0xfd; // from its own address
    na[40] = 136;
    na[48..64].copy_from_slice(&ours.octets());
    na[64] = 2;
    na[65] = 1;
    na[66..72].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
    assert_eq!(dad_conflict(&na, ours, wire), Some([2, 0, 0, 0, 0, 9]));
    assert_eq!(dad_conflict(&na[..64], ours, wire), Some(wire));
    // Not a conflict: another address, address resolution (from a
    // real source), a truncated or non-ICMPv6 packet.
    assert_eq!(dad_conflict(&na, "fd00:59::3".parse().unwrap(), wire), None);
    let mut resolution = p;
    resolution[8] = 0xfd;
    assert_eq!(dad_conflict(&resolution, ours, wire), None);
    assert_eq!(dad_conflict(&p[..50], ours, wire), None);
    let mut udp = p;
    udp[6] = 17;
    assert_eq!(dad_conflict(&udp, ours, wire), None);
}

#[test]
fn solicitations_and_advertisements() {
    let gw: Ipv6Addr = "fd00:213::1".parse().unwrap();
    assert_eq!(
        solicited_node(gw),
        "ff02::1:ff00:1".parse::<Ipv6Addr>().unwrap()
    );
    let odd: Ipv6Addr = "fd00::ab:cdef".parse().unwrap();
    assert_eq!(
        solicited_node(odd),
        "ff02::1:ffab:cdef".parse::<Ipv6Addr>().unwrap()
    );
    let ns = solicitation([2, 0, 0, 0, 0, 1], gw);
    assert_eq!(ns[0], 135);
    assert_eq!(&ns[8..24], &gw.octets());
    assert_eq!(&ns[24..32], &[1, 1, 2, 0, 0, 0, 0, 1]);
    let mut na = [0u8; 32];
    na[0] = 136;
    na[4] = 0x60; // solicited, override
    na[8..24].copy_from_slice(&gw.octets());
    na[24] = 2;
    na[25] = 1;
    na[26..32].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
    assert_eq!(advertised(&na, gw), Some(Some([2, 0, 0, 0, 0, 9])));
    assert_eq!(
        advertised(&na[..24], gw),
        Some(None),
        "an NA without the option still answers"
    );
    assert_eq!(advertised(&na, "fd00:213::2".parse().unwrap()), None);
    assert_eq!(advertised(&ns, gw), None, "a solicitation is not an answer");
    let mut bad = na;
    bad[25] = 0; // a zero-length option must not loop
    assert_eq!(advertised(&bad, gw), Some(None));
}
