import UploadS3

/// Where an S3 store keeps objects, and how it signs.
public struct S3StoreConfiguration: Sendable {
    public var endpoint: S3Endpoint
    public var credentials: S3Credentials
    public var bucket: String
    /// Put before every `ACCOUNT/KEY`; may be empty.
    public var prefix: String
    /// The least part but the last (S3's least is 5 MiB; some servers take less).
    public var minPartBytes: Int64 = S3StoreConfiguration.s3MinPartBytes
    /// S3's least part but the last.
    public static let s3MinPartBytes: Int64 = 5 << 20
    /// Uploads of one commit group made objects at once (`--s3-commits-at-once`).
    public var commitsAtOnce = S3StoreConfiguration.defaultCommitsAtOnce
    /// The default ``commitsAtOnce``: 8.
    public static let defaultCommitsAtOnce = 8

    public init(endpoint: S3Endpoint, credentials: S3Credentials, bucket: String, prefix: String) {
        self.endpoint = endpoint
        self.credentials = credentials
        self.bucket = bucket
        self.prefix = prefix
    }
}
