"""The real node's cluster DNS: the records of Kubernetes' DNS specification that the tests need, answered from
the API server at query time (no cache: a pod recreated a second ago resolves to its new address).

    PYTHONPATH=scripts python -m k8s.realnode_dns --kubeconfig KUBECONFIG --listen 10.244.0.1

The kubelet's clusterDNS points here, so pods of dnsPolicy ClusterFirst resolve
  * `<service>.<namespace>.svc.cluster.local`: a ClusterIP Service's IP, a headless Service's endpoint addresses;
  * `<hostname>.<service>.<namespace>.svc.cluster.local`: the pod of a headless Service's EndpointSlices with that
    hostname (a pod's `hostname` and `subdomain`: how a LeaderWorkerSet's workers reach their leader,
    LWS_LEADER_ADDRESS), ready or not (LWS's Service publishes not-ready addresses);
and nothing else (NXDOMAIN; an A-less name of a Service gets an empty answer). IPv4 only; UDP only (the answers
are small). The real node's pods reach no other DNS, by design (k8s.realnode).
"""

from __future__ import annotations

import argparse
import logging
import socket

import dns.exception
import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
from kubernetes import client as kube
from kubernetes import config as kube_config

log = logging.getLogger("realnode-dns")
DOMAIN = "svc.cluster.local."
TTL = 5


def addresses(core: kube.CoreV1Api, discovery: kube.DiscoveryV1Api, name: str) -> list[str] | None:
    """The IPv4 addresses of a cluster name (None: no such name)."""
    if not name.endswith("." + DOMAIN):
        return None
    labels = name.removesuffix("." + DOMAIN).split(".")
    if len(labels) not in (2, 3):
        return None
    *host, service, namespace = labels
    try:
        svc = core.read_namespaced_service(service, namespace)
    except kube.exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    headless = svc.spec.cluster_ip in (None, "None")
    if not host and not headless:
        return [svc.spec.cluster_ip]
    slices = discovery.list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={service}").items
    found = [address for s in slices if s.address_type == "IPv4" for e in s.endpoints or []
             if not host or e.hostname == host[0] for address in e.addresses]
    return found if found or not host else None


def answer(query: dns.message.Message, core: kube.CoreV1Api, discovery: kube.DiscoveryV1Api) -> dns.message.Message:
    response = dns.message.make_response(query)
    response.flags |= dns.flags.AA
    if len(query.question) != 1:
        response.set_rcode(dns.rcode.FORMERR)
        return response
    question = query.question[0]
    name = question.name.to_text().lower()
    found = addresses(core, discovery, name)
    if found is None:
        response.set_rcode(dns.rcode.NXDOMAIN)
    elif question.rdtype == dns.rdatatype.A and found:
        response.answer.append(dns.rrset.from_text_list(question.name, TTL, "IN", "A", found))
    log.info("%s %s -> %s", dns.rdatatype.to_text(question.rdtype), name, found)
    return response


def serve(listen: str, port: int, kubeconfig: str) -> None:
    kube_config.load_kube_config(kubeconfig)
    core, discovery = kube.CoreV1Api(), kube.DiscoveryV1Api()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((listen, port))
    log.info("serving %s on %s:%d", DOMAIN, listen, port)
    while True:
        data, peer = sock.recvfrom(4096)
        try:
            query = dns.message.from_wire(data)
        except dns.exception.DNSException:
            continue  # not a DNS query: nothing to answer
        try:
            response = answer(query, core, discovery)
        except Exception:  # noqa: BLE001  the API server unreachable: the client retries
            log.exception("answering %s", query.question)
            response = dns.message.make_response(query)
            response.set_rcode(dns.rcode.SERVFAIL)
        sock.sendto(response.to_wire(), peer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--listen", required=True, help="the address the kubelet's clusterDNS names")
    parser.add_argument("--port", type=int, default=53)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    serve(args.listen, args.port, args.kubeconfig)


if __name__ == "__main__":
    main()
