/* The job of the launch benchmark at scale: MPI init + one allreduce, no Python, no torch
 * (128 ranks importing torch on 2 cores would measure imports, not the launcher). Rank 0
 * prints the sum; every rank checks it. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int rank, size, one = 1, total = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&one, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (total != size) {
        fprintf(stderr, "rank %d: allreduce gave %d, expected %d\n", rank, total, size);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0) printf("allreduce over %d ranks: %d\n", size, total);
    MPI_Finalize();
    return 0;
}
