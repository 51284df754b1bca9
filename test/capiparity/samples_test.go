package capiparity

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
)

// role is what kubeadm does on the sample's Machine.
type role string

const (
	roleInit   role = "init"    // the first control plane: kubeadm init
	roleJoin   role = "join"    // a worker: kubeadm join
	roleJoinCP role = "join-cp" // another control plane: kubeadm join --control-plane
)

// Formats, by the spec's format value.
const (
	cloudConfig = "cloud-config"
	ignitionFmt = "ignition"
)

// sample is a KubeadmConfig spec written the way CABPK users write it.
type sample struct {
	name string
	role role
	// only limits the sample to one format ("" for both).
	only string
	// spec is the spec's YAML, without format: each format renders it.
	spec string
}

// base names the sample without fields of a role: every other sample's
// differences are counted beyond its role's base differences.
func base(r role) string { return "base/" + string(r) }

// Secrets every sample's namespace holds (contentFrom, passwdFrom).
var sampleSecrets = map[string]map[string]string{
	"parity-files": {
		"encryption.yaml": "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - identity: {}\n",
		"ops-passwd":      passwdHash,
	},
}

const passwdHash = "$6$rounds=4096$paritysalt$Q3l0sOm5nF3Bq2l0Y7cGk1pR9dZ3uV6wT4aE8sH2jL5nM7bC1xQ0yI9oP3rU6tW2eA4gD8fJ1kN5hS7lZ0vX3/"

// userToken is the bootstrap token the joinConfiguration sample names.
const userToken = "abcdef.0123456789abcdef"

func gzipBase64(s string) string {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, _ = zw.Write([]byte(s))
	_ = zw.Close()
	return base64.StdEncoding.EncodeToString(b.Bytes())
}

// samples cover every field of upstream's KubeadmConfigSpec
// (TestSamplesCoverEveryField), each near the others it is used with.
var samples = []sample{
	{name: base(roleInit), role: roleInit, spec: `{}`},
	{name: base(roleJoin), role: roleJoin, spec: `{}`},
	{name: base(roleJoinCP), role: roleJoinCP, spec: `{}`},

	// files
	{name: "files: inline, owner, permissions", role: roleJoin, spec: `
files:
- path: /etc/motd
  content: |
    managed by Cluster API
  owner: root:adm
  permissions: "0640"
`},
	{name: "files: no permissions", role: roleJoin, spec: `
files:
- path: /etc/motd
  content: |
    managed by Cluster API
`},
	{name: "files: encoding base64", role: roleJoin, spec: `
files:
- path: /etc/kubernetes/audit-policy.yaml
  permissions: "0644"
  encoding: base64
  content: YXBpVmVyc2lvbjogYXVkaXQuazhzLmlvL3YxCmtpbmQ6IFBvbGljeQpydWxlczoKLSBsZXZlbDogTWV0YWRhdGEK
`},
	{name: "files: encoding gzip+base64", role: roleJoin, spec: `
files:
- path: /etc/sysctl.d/90-kubernetes.conf
  permissions: "0644"
  encoding: gzip+base64
  content: ` + gzipBase64("net.ipv4.ip_forward = 1\n") + `
`},
	{name: "files: append", role: roleJoin, spec: `
files:
- path: /etc/hosts
  permissions: "0644"
  append: true
  content: |
    10.0.0.10 registry.example
`},
	{name: "files: contentFrom", role: roleJoin, spec: `
files:
- path: /etc/kubernetes/encryption.yaml
  permissions: "0600"
  contentFrom:
    secret:
      name: parity-files
      key: encryption.yaml
`},
	{name: "files: contentFormat Template", role: roleJoin, spec: `
files:
- path: /etc/cluster-info
  permissions: "0644"
  contentFormat: Template
  content: |
    control plane: {{ if .controlPlane }}{{ .controlPlane.version }}{{ else }}standalone{{ end }}
`},

	// disks and mounts
	{name: "diskSetup.partitions: layout", role: roleJoin, spec: `
diskSetup:
  partitions:
  - device: /dev/sdb
    layout: true
    overwrite: false
    tableType: gpt
`},
	{name: "diskSetup.partitions: diskLayout", role: roleJoin, spec: `
diskSetup:
  partitions:
  - device: /dev/sdc
    tableType: mbr
    diskLayout:
    - percentage: 70
      partitionType: Linux
    - percentage: 30
      partitionType: LinuxSwap
`},
	{name: "diskSetup.filesystems: every option", role: roleJoin, spec: `
diskSetup:
  filesystems:
  - device: /dev/sdb
    partition: auto
    filesystem: ext4
    label: etcd_disk
    overwrite: false
    replaceFS: ntfs
    extraOpts: ["-E", "lazy_itable_init=1,lazy_journal_init=1"]
`},
	{name: "diskSetup.filesystems: minimal", role: roleJoin, spec: `
diskSetup:
  filesystems:
  - device: /dev/sdb1
    filesystem: ext4
    label: etcd_disk
`},
	{name: "mounts: a file system by LABEL=", role: roleJoin, spec: `
diskSetup:
  filesystems:
  - device: /dev/sdb1
    filesystem: ext4
    label: etcd_disk
    overwrite: false
mounts:
- - LABEL=etcd_disk
  - /var/lib/etcddisk
`},
	{name: "mounts: a file system by its label alone", role: roleJoin, spec: `
diskSetup:
  filesystems:
  - device: /dev/sdb1
    filesystem: ext4
    label: etcd_disk
    overwrite: false
mounts:
- - etcd_disk
  - /var/lib/etcddisk
`},
	{name: "mounts: a device with type and options", role: roleJoin, spec: `
mounts:
- [/dev/sdc1, /data, ext4, "defaults,noatime", "0", "2"]
`},

	// commands
	{name: "bootCommands", role: roleJoin, spec: `
bootCommands:
- echo boot > /run/boot-marker
`},
	{name: "preKubeadmCommands", role: roleJoin, spec: `
preKubeadmCommands:
- swapoff -a
- sed -i '/ swap / s/^/#/' /etc/fstab
`},
	{name: "postKubeadmCommands", role: roleJoin, spec: `
postKubeadmCommands:
- echo joined > /run/post-marker
`},
	{name: "verbosity", role: roleJoin, spec: `
verbosity: 5
`},

	// users
	{name: "users: sshAuthorizedKeys", role: roleJoin, spec: `
users:
- name: ops
  sshAuthorizedKeys:
  - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKZpYXJpdHl0ZXN0a2V5c3RyaW5nMDEyMzQ1Njc4 ops@example
`},
	{name: "users: gecos", role: roleJoin, spec: `
users:
- name: ops
  gecos: Operations team
`},
	{name: "users: groups", role: roleJoin, spec: `
users:
- name: ops
  groups: docker, wheel
`},
	{name: "users: homeDir", role: roleJoin, spec: `
users:
- name: ops
  homeDir: /home/operations
`},
	{name: "users: inactive", role: roleJoin, spec: `
users:
- name: ops
  inactive: true
`},
	{name: "users: shell", role: roleJoin, spec: `
users:
- name: ops
  shell: /bin/bash
`},
	{name: "users: passwd", role: roleJoin, spec: `
users:
- name: ops
  passwd: "` + passwdHash + `"
`},
	{name: "users: passwdFrom", role: roleJoin, spec: `
users:
- name: ops
  passwdFrom:
    secret:
      name: parity-files
      key: ops-passwd
`},
	{name: "users: primaryGroup", role: roleJoin, spec: `
users:
- name: ops
  primaryGroup: operators
`},
	{name: "users: lockPassword", role: roleJoin, spec: `
users:
- name: ops
  lockPassword: false
`},
	{name: "users: sudo", role: roleJoin, spec: `
users:
- name: ops
  sudo: ALL=(ALL) NOPASSWD:ALL
`},

	// ntp
	{name: "ntp: servers", role: roleJoin, spec: `
ntp:
  servers: [0.pool.ntp.org, time.example.com]
`},
	{name: "ntp: enabled", role: roleJoin, spec: `
ntp:
  enabled: true
  servers: [time.example.com]
`},
	{name: "ntp: enabled false", role: roleJoin, spec: `
ntp:
  enabled: false
  servers: [time.example.com]
`},

	// ignition
	{name: "ignition.containerLinuxConfig", role: roleJoin, only: ignitionFmt, spec: `
ignition:
  containerLinuxConfig:
    strict: true
    additionalConfig: |
      systemd:
        units:
        - name: chronyd.service
          enabled: true
`},

	// kubeadm
	{name: "clusterConfiguration", role: roleInit, spec: `
clusterConfiguration:
  etcd:
    local:
      imageRepository: registry.example/etcd
      imageTag: 3.6.8-0
      dataDir: /var/lib/etcddisk/etcd
      extraArgs:
      - {name: quota-backend-bytes, value: "8589934592"}
      extraEnvs:
      - {name: ETCD_LOG_LEVEL, value: info}
      serverCertSANs: [etcd.example]
      peerCertSANs: [etcd-peer.example]
  controlPlaneEndpoint: api.example:6443
  apiServer:
    extraArgs:
    - {name: audit-log-maxage, value: "30"}
    extraVolumes:
    - {name: audit, hostPath: /var/log/kubernetes, mountPath: /var/log/kubernetes, readOnly: true, pathType: DirectoryOrCreate}
    extraEnvs:
    - {name: HTTPS_PROXY, value: "http://proxy.example:3128"}
    certSANs: [api.example, 10.0.0.10]
  controllerManager:
    extraArgs:
    - {name: bind-address, value: 0.0.0.0}
    extraVolumes:
    - {name: cloud, hostPath: /etc/cloud, mountPath: /etc/cloud, readOnly: true, pathType: Directory}
    extraEnvs:
    - {name: GOMAXPROCS, value: "4"}
  scheduler:
    extraArgs:
    - {name: bind-address, value: 0.0.0.0}
    extraVolumes:
    - {name: scheduler-config, hostPath: /etc/kubernetes/scheduler, mountPath: /etc/kubernetes/scheduler, readOnly: true, pathType: Directory}
    extraEnvs:
    - {name: GOMAXPROCS, value: "2"}
  dns:
    imageRepository: registry.example/coredns
    imageTag: v1.12.1
  certificatesDir: /etc/kubernetes/custom-pki
  imageRepository: registry.example/k8s
  featureGates:
    ControlPlaneKubeletLocalMode: true
  certificateValidityPeriodDays: 365
  caCertificateValidityPeriodDays: 3650
  encryptionAlgorithm: ECDSA-P256
`},
	{name: "clusterConfiguration.etcd.external", role: roleInit, spec: `
clusterConfiguration:
  etcd:
    external:
      endpoints: [https://etcd-0.example:2379]
      caFile: /etc/kubernetes/pki/etcd/ca.crt
      certFile: /etc/kubernetes/pki/apiserver-etcd-client.crt
      keyFile: /etc/kubernetes/pki/apiserver-etcd-client.key
`},
	{name: "initConfiguration", role: roleInit, spec: `
initConfiguration:
  bootstrapTokens:
  - token: abcdef.0123456789abcdef
    description: parity test token
    ttlSeconds: 3600
    usages: [signing, authentication]
    groups: ["system:bootstrappers:kubeadm:default-node-token"]
  - token: ghijkl.0123456789abcdef
    expires: "2030-01-01T00:00:00Z"
  nodeRegistration:
    name: '{{ ds.meta_data.local_hostname }}'
    criSocket: unix:///var/run/containerd/containerd.sock
    taints:
    - {key: node-role.kubernetes.io/control-plane, effect: NoSchedule}
    kubeletExtraArgs:
    - {name: cloud-provider, value: external}
    ignorePreflightErrors: [NumCPU]
    imagePullPolicy: IfNotPresent
    imagePullSerial: false
  localAPIEndpoint:
    advertiseAddress: 10.0.0.11
    bindPort: 6443
  skipPhases: [addon/kube-proxy]
  patches:
    directory: /etc/kubernetes/patches
  timeouts:
    controlPlaneComponentHealthCheckSeconds: 240
    kubeletHealthCheckSeconds: 240
    kubernetesAPICallSeconds: 60
    etcdAPICallSeconds: 120
    tlsBootstrapSeconds: 300
    discoverySeconds: 300
`},
	{name: "joinConfiguration", role: roleJoin, spec: `
joinConfiguration:
  nodeRegistration:
    name: '{{ ds.meta_data.local_hostname }}'
    criSocket: unix:///var/run/containerd/containerd.sock
    taints:
    - {key: dedicated, value: gpu, effect: NoSchedule}
    kubeletExtraArgs:
    - {name: node-labels, value: tier=gpu}
    ignorePreflightErrors: [Swap]
    imagePullPolicy: Always
    imagePullSerial: true
  caCertPath: /etc/kubernetes/pki/ca.crt
  discovery:
    bootstrapToken:
      token: ` + userToken + `
      apiServerEndpoint: api.example:6443
      caCertHashes: ["sha256:7c4c1a1a5ab0f2c9a0b1d6f7e8a9b0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7"]
      unsafeSkipCAVerification: false
    tlsBootstrapToken: ` + userToken + `
  skipPhases: [preflight]
  patches:
    directory: /etc/kubernetes/patches
  timeouts:
    controlPlaneComponentHealthCheckSeconds: 240
    kubeletHealthCheckSeconds: 240
    kubernetesAPICallSeconds: 60
    etcdAPICallSeconds: 120
    tlsBootstrapSeconds: 300
    discoverySeconds: 300
`},
	{name: "joinConfiguration.discovery.file: authProvider", role: roleJoin, spec: `
joinConfiguration:
  discovery:
    file:
      kubeConfigPath: /etc/kubernetes/discovery.conf
      kubeConfig:
        cluster:
          server: https://api.example:6443
          tlsServerName: api.example
          insecureSkipTLSVerify: false
          certificateAuthorityData: ` + base64.StdEncoding.EncodeToString([]byte("parity CA bundle\n")) + `
          proxyURL: http://proxy.example:3128
        user:
          authProvider:
            name: oidc
            config:
              client-id: parity
`},
	{name: "joinConfiguration.discovery.file: exec", role: roleJoin, spec: `
joinConfiguration:
  discovery:
    file:
      kubeConfigPath: /etc/kubernetes/discovery.conf
      kubeConfig:
        user:
          exec:
            command: /usr/local/bin/token-helper
            args: [--cluster, parity]
            env:
            - {name: REGION, value: eu-central-1}
            apiVersion: client.authentication.k8s.io/v1
            provideClusterInfo: true
`},
	{name: "joinConfiguration.controlPlane", role: roleJoinCP, spec: `
joinConfiguration:
  controlPlane:
    localAPIEndpoint:
      advertiseAddress: 10.0.0.12
      bindPort: 6443
`},
}
