package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The control plane runs in the segment's network namespace, at the
// segment's gateway address: the nodes reach it over the bridge, the
// harness through dialers that open their sockets in that namespace.
// Nothing listens on the machine's own interfaces.
const apiPort = 6443

// pki is the control plane's certificates, PEM: one CA, the API server's
// serving certificate, an admin client (system:masters) and the service
// account key.
type pki struct {
	caCert, apiCert, apiKey, adminCert, adminKey, saKey, saPub []byte
}

func pemOf(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func newPKI(apiIP net.IP) (*pki, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now().Add(-time.Hour)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "scale-ca"}, NotBefore: now, NotAfter: now.Add(48 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caParsed, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	issue := func(serial int64, subj pkix.Name, usage x509.ExtKeyUsage, ips []net.IP, dns []string) (cert, key []byte, err error) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: subj, NotBefore: now, NotAfter: now.Add(48 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips, DNSNames: dns}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caParsed, &k.PublicKey, caKey)
		if err != nil {
			return nil, nil, err
		}
		kder, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, nil, err
		}
		return pemOf("CERTIFICATE", der), pemOf("EC PRIVATE KEY", kder), nil
	}
	p := &pki{caCert: pemOf("CERTIFICATE", caDER)}
	if p.apiCert, p.apiKey, err = issue(2, pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth,
		[]net.IP{apiIP, net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")}, []string{"kubernetes", "kubernetes.default"}); err != nil {
		return nil, err
	}
	if p.adminCert, p.adminKey, err = issue(3, pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}}, x509.ExtKeyUsageClientAuth, nil, nil); err != nil {
		return nil, err
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return nil, err
	}
	p.saKey, p.saPub = pemOf("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa)), pemOf("PUBLIC KEY", pub)
	return p, nil
}

// write puts the files in dir, for the API server's flags.
func (p *pki) write(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, b := range map[string][]byte{"ca.crt": p.caCert, "apiserver.crt": p.apiCert, "apiserver.key": p.apiKey, "sa.key": p.saKey, "sa.pub": p.saPub} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// kubeconfig writes a kubeconfig for the admin at server (an agent's own
// proxy address, or the API server's).
func (p *pki) kubeconfig(path, server string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["scale"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: p.caCert}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: p.adminCert, ClientKeyData: p.adminKey}
	cfg.Contexts["scale"] = &clientcmdapi.Context{Cluster: "scale", AuthInfo: "admin"}
	cfg.CurrentContext = "scale"
	return clientcmd.WriteToFile(*cfg, path)
}

// nsDialer dials from network namespace n: the socket is made there and
// stays there.
func nsDialer(n ns.NetNS) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := n.Do(func(ns.NetNS) error {
			var err error
			c, err = (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// client is the harness's own client of the API server: protobuf, and
// enough QPS to fill the cluster in minutes.
func (p *pki) client(n ns.NetNS, server string) (*kubernetes.Clientset, *rest.Config, error) {
	cfg := &rest.Config{Host: server, TLSClientConfig: rest.TLSClientConfig{CAData: p.caCert, CertData: p.adminCert, KeyData: p.adminKey},
		Dial: nsDialer(n), QPS: 5000, Burst: 5000, Timeout: 60 * time.Second,
		ContentConfig: rest.ContentConfig{ContentType: "application/vnd.kubernetes.protobuf", AcceptContentTypes: "application/vnd.kubernetes.protobuf,application/json"}}
	c, err := kubernetes.NewForConfig(cfg)
	return c, cfg, err
}

// startIn starts a command in network namespace n, its output appended to
// logFile, in a process group of its own (the terminal's Ctrl-C reaches the
// harness, which stops it).
func startIn(n ns.NetNS, logFile string, env []string, name string, args ...string) (*exec.Cmd, error) {
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = sysProcAttr()
	err = n.Do(func(ns.NetNS) error { return cmd.Start() })
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return cmd, nil
}

// controlPlane starts etcd and the API server in n (the segment's
// namespace) with their state under dir and etcd's data in dataDir (a
// tmpfs: etcd's fsyncs are not what is measured), and waits for /readyz.
func (h *harness) controlPlane(ctx context.Context) error {
	n := h.seg.NS
	apiIP := segmentGW4
	p, err := newPKI(apiIP)
	if err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	h.pki = p
	pkiDir := filepath.Join(h.dir, "pki")
	if err := p.write(pkiDir); err != nil {
		return err
	}
	etcd, err := startIn(n, filepath.Join(h.dir, "logs", "etcd.log"), nil, "etcd", "--name", "scale", "--data-dir", h.etcdDir,
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "scale=http://127.0.0.1:2380", "--quota-backend-bytes", fmt.Sprint(8<<30), "--log-level", "warn")
	if err != nil {
		return err
	}
	h.procs = append(h.procs, etcd)
	api, err := startIn(n, filepath.Join(h.dir, "logs", "kube-apiserver.log"), nil, filepath.Join(h.cfg.k8sDir, "kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379", "--advertise-address="+apiIP.String(), fmt.Sprintf("--secure-port=%d", apiPort),
		"--tls-cert-file="+filepath.Join(pkiDir, "apiserver.crt"), "--tls-private-key-file="+filepath.Join(pkiDir, "apiserver.key"),
		"--client-ca-file="+filepath.Join(pkiDir, "ca.crt"), "--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file="+filepath.Join(pkiDir, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(pkiDir, "sa.key"), "--service-cluster-ip-range=10.96.0.0/16",
		// No controller manager makes the namespaces' default service
		// accounts: pods are written without one, as a kubelet-less
		// generator writes them.
		"--disable-admission-plugins=ServiceAccount",
		// The generator writes at thousands of requests per second; the
		// agents' watches are what is measured, not fairness.
		"--enable-priority-and-fairness=false", "--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000")
	if err != nil {
		return err
	}
	h.procs = append(h.procs, api)
	h.apiURL = fmt.Sprintf("https://%s", net.JoinHostPort(apiIP.String(), fmt.Sprint(apiPort)))
	if h.client, h.restCfg, err = p.client(n, h.apiURL); err != nil {
		return err
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		body, err := h.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("kube-apiserver not ready within 3 min (last: %v; see %s)", err, filepath.Join(h.dir, "logs", "kube-apiserver.log"))
		}
		time.Sleep(500 * time.Millisecond)
	}
	h.logf("control plane up: etcd and kube-apiserver at %s (in the segment's namespace)", h.apiURL)
	return nil
}
